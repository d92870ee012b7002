"""plot_training_log: training curves of one or more Caffe logs as a PNG.

Caffe: tools/extra/plot_training_log.py.example.

Usage (Caffe's)::

    plot_training_log CHART_TYPE[0-7] /where/to/save.png /path/to/first.log [more.log ...]

Chart types, as Caffe numbers them::

    0: Test accuracy  vs. Iters         4: Train learning rate  vs. Iters
    1: Test accuracy  vs. Seconds       5: Train learning rate  vs. Seconds
    2: Test loss  vs. Iters             6: Train loss  vs. Iters
    3: Test loss  vs. Seconds           7: Train loss  vs. Seconds

"Train loss" is the loss Caffe displays (``Iteration N (...), loss = X``, smoothed over
``average_loss`` iterations), what Caffe's script plots; the test curves take the first test
output whose name contains ``accuracy`` / ``loss``. One line per log, labelled by the log's
file name (with its folder when names repeat). Drawn with matplotlib's Agg backend (no display
needed); unlike Caffe's script, colours and markers are fixed, not random, the legend goes
where it hides least, and logs need not end in ``.log``.
"""
import os
import sys

from ._common import Parser, ToolError, run

PROG = "plot_training_log"

CHART_TYPES = [
    ("Test", "accuracy", "Iters"), ("Test", "accuracy", "Seconds"),
    ("Test", "loss", "Iters"), ("Test", "loss", "Seconds"),
    ("Train", "learning rate", "Iters"), ("Train", "learning rate", "Seconds"),
    ("Train", "loss", "Iters"), ("Train", "loss", "Seconds"),
]


def chart_description(chart_type):
    kind, field, x_axis = CHART_TYPES[chart_type]
    return f"{kind} {field}  vs. {x_axis}"


def _test_column(rows, field):
    for row in rows:
        for name in list(row)[3:]:
            if field in name.lower():
                return name
    return None


def series(parsed, chart_type):
    """(x, y) lists of one log's curve for ``chart_type``.

    Raises:
        ToolError: the log has no data for that chart.
    """
    kind, field, x_axis = CHART_TYPES[chart_type]
    xi = 0 if x_axis == "Iters" else 1
    if kind == "Train" and field == "loss":
        points = [(p[xi], p[2]) for p in parsed.display_loss]
        if not points and parsed.train:   # no display lines: the first train output
            name = _test_column(parsed.train, "loss")
            key = "NumIters" if xi == 0 else "Seconds"
            points = [(r[key], r[name]) for r in parsed.train if name and name in r]
    elif kind == "Train":
        key = "NumIters" if xi == 0 else "Seconds"
        points = [(r[key], r["LearningRate"]) for r in parsed.train]
    else:
        name = _test_column(parsed.test, field)
        key = "NumIters" if xi == 0 else "Seconds"
        points = [(r[key], r[name]) for r in parsed.test if name and name in r]
    if not points:
        raise ToolError(f"the log has no data for '{chart_description(chart_type)}'")
    return [p[0] for p in points], [p[1] for p in points]


def labels_for(paths):
    """Curve labels: the file name without ``.log``; with the folder when names repeat."""
    names = [os.path.splitext(os.path.basename(p))[0] for p in paths]
    if len(set(names)) == len(names):
        return names
    return [os.path.join(os.path.basename(os.path.dirname(os.path.abspath(p))), n)
            for p, n in zip(paths, names)]


def plot_chart(chart_type, path_to_png, log_paths):
    """Draw and save the chart (see the module docstring).

    Raises:
        ToolError: matplotlib missing, a bad chart type or PNG path, a log without data.
    """
    from .parse_log import parse_log_full
    if not 0 <= chart_type < len(CHART_TYPES):
        raise ToolError(f"{chart_type} is not a valid chart type (0-{len(CHART_TYPES) - 1})")
    if not str(path_to_png).lower().endswith(".png"):
        raise ToolError(f"the output path must end with .png: {path_to_png}")
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise ToolError("plotting needs matplotlib (pip install 'caffe_engine[tools]')") from None
    kind, field, x_axis = CHART_TYPES[chart_type]
    data = []
    for path in log_paths:
        if not os.path.exists(path):
            raise ToolError(f"Path does not exist: {path}")
        x, y = series(parse_log_full(path), chart_type)
        data.append((x, y))
    fig, ax = plt.subplots(figsize=(8, 5), dpi=100)
    markers = "os^vD<>ph*"
    for k, ((x, y), label) in enumerate(zip(data, labels_for(log_paths))):
        ax.plot(x, y, label=label, linewidth=1.0, color=f"C{k % 10}",
                marker=markers[k % len(markers)] if len(x) <= 60 else None, markersize=4)
    ax.set_title(chart_description(chart_type))
    ax.set_xlabel(x_axis)
    ax.set_ylabel(f"{kind} {field}")
    ax.grid(True, alpha=0.3)
    ax.legend(loc="best", ncol=1)      # Caffe's script: lower right / upper right by field
    fig.tight_layout()
    fig.savefig(path_to_png)
    plt.close(fig)


def build_parser():
    types = "\n".join(f"    {i}: {chart_description(i)}" for i in range(len(CHART_TYPES)))
    p = Parser(prog=PROG, description="Plot training curves of Caffe logs into a PNG.",
               epilog="Supported chart types:\n" + types,
               formatter_class=__import__("argparse").RawDescriptionHelpFormatter)
    p.add_argument("chart_type", type=int, help=f"0-{len(CHART_TYPES) - 1}, see below")
    p.add_argument("path_to_png", help="where to save the chart (.png)")
    p.add_argument("logs", nargs="+", metavar="LOG", help="training log(s)")
    return p


def _main(argv):
    args = build_parser().parse_args(argv)
    plot_chart(args.chart_type, args.path_to_png, args.logs)
    return 0


def main(argv=None):
    return run(PROG, _main, sys.argv[1:] if argv is None else argv)


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""cost_model: fit the alpha-beta and link models on allreduce benchmarks; FireCaffe's numbers.

Usage::

    python tools/cost_model.py --fit results.json --save model.json   # AlphaBetaModel per algorithm
    python tools/cost_model.py --fit-links docs/bench/netlab/1gbit/results.json \
        --fit-min-bytes 4194304                                   # LinkModel, measured/predicted
    python tools/cost_model.py --report results.json --links-model links_model.json
    python tools/cost_model.py --firecaffe                        # docs/scaling.md's table
    python tools/cost_model.py hybrid --net VGG_ILSVRC_16_layers_deploy.prototxt --batch 8 \
        --procs 2 4 8 --bandwidth 1gbit --latency 50us         # PCL-DNN's hybrid FC layers

The models are caffe_engine/perf (:mod:`caffe_engine.perf.alpha_beta`,
:mod:`caffe_engine.perf.link_model`, :mod:`caffe_engine.perf.firecaffe`); results.json is what
tools/bench_allreduce.py writes. docs/scaling.md, "Cost model", has the tables.

``hybrid`` (:mod:`caffe_engine.perf.hybrid`, the balance equations of
:mod:`caffe_engine.comm.hybrid_cost`): per InnerProduct layer of ``--net`` (a prototxt, built at
batch 1, or a BVLC shape report ``.json``) and per group size G dividing each P, one rank's
bytes sent per iteration, the layer's predicted time and share of the iteration at
``--fc_parallel G``, and the best G; then per P the predicted iteration and speedup for every
G and ``auto``. The link: ``--bandwidth`` (payload rate) and ``--latency`` plus ``--overhead``
per message, or ``--links-model`` (a saved LinkModel: its alpha and beta) plus ``--latency``.
"""
import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from caffe_engine.comm.hybrid_cost import Link  # noqa: E402
from caffe_engine.errors import CaffeError  # noqa: E402
from caffe_engine.perf.alpha_beta import fit_alpha_beta  # noqa: E402
from caffe_engine.perf.firecaffe import formula_table  # noqa: E402
from caffe_engine.perf.link_model import LinkModel  # noqa: E402
from caffe_engine.perf.link_report import link_report, loopback_rate  # noqa: E402
from caffe_engine.perf import hybrid  # noqa: E402


def parser():
    """The command line (see the module docstring)."""
    ap = argparse.ArgumentParser(description="Fit the alpha-beta model; FireCaffe predictions.")
    ap.add_argument("--fit", help="results.json of tools/bench_allreduce.py")
    ap.add_argument("--save", help="write the fitted model here (JSON)")
    ap.add_argument("--stat", default="seconds", choices=["seconds", "min_seconds"],
                    help="fit the median (default) or the fastest repetition")
    ap.add_argument("--fit-links", metavar="RESULTS",
                    help="fit the link model (one alpha, one beta) on a results.json of "
                         "tools/bench_allreduce.py --netlab and print measured against predicted")
    ap.add_argument("--fit-procs", type=int, nargs="+", help="fit on the rows of these P only")
    ap.add_argument("--fit-min-bytes", type=int, default=0,
                    help="fit on the rows of at least this many bytes only")
    ap.add_argument("--links-model", metavar="JSON",
                    help="with --report: a saved link model instead of fitting")
    ap.add_argument("--report", metavar="RESULTS",
                    help="measured against --links-model's predictions for these rows")
    ap.add_argument("--intra-bandwidth", type=float,
                    help="bits/s within a host for the link model (default: the loopback "
                         "stream the results measured; shared memory: free)")
    ap.add_argument("--save-links", help="write the fitted link model here (JSON)")
    ap.add_argument("--firecaffe", action="store_true", help="print FireCaffe predictions")
    ap.add_argument("--bandwidths", type=float, nargs="+", default=[1e9, 2.5e9, 6e9, 10e9])
    return ap


def print_fit(args):
    """--fit: the alpha-beta model per algorithm as a table (and --save)."""
    model = fit_alpha_beta(args.fit, stat=args.stat)
    print("| algorithm | alpha (us) | beta (ns/byte) | 1/beta (GB/s) |")
    print("|---|---|---|---|")
    for alg, p in sorted(model.params.items()):
        bw = 1 / p["beta"] / 1e9 if p["beta"] > 0 else float("inf")
        print(f"| {alg} | {p['alpha'] * 1e6:.1f} | {p['beta'] * 1e9:.3f} | {bw:.2f} |")
    if args.save:
        model.save(args.save)


def print_links(args):
    """--fit-links / --report: the link model, fitted or read, against the rows."""
    path = args.fit_links or args.report
    with open(path) as f:
        d = json.load(f)
    rows = d["rows"] if isinstance(d, dict) else d
    if args.fit_links:
        model = LinkModel.fit(rows, procs=args.fit_procs, min_bytes=args.fit_min_bytes,
                              stat=args.stat)
    elif args.links_model:
        model = LinkModel.load(args.links_model)
    else:
        raise CaffeError("--report needs --links-model (or use --fit-links)")
    intra = args.intra_bandwidth or loopback_rate(d)
    if intra:
        model.beta_intra = 8.0 / intra
    if args.save_links:
        model.save(args.save_links)
    print(link_report(model, rows, stat=args.stat))


def hybrid_parser():
    """The ``hybrid`` subcommand's command line."""
    ap = argparse.ArgumentParser(prog="cost_model.py hybrid",
                                 description="PCL-DNN's balance equations per InnerProduct layer")
    ap.add_argument("--net", required=True, help="net prototxt, or a BVLC shape report (.json)")
    ap.add_argument("--classes", type=int, nargs=2, metavar=("OLD", "NEW"),
                    help="resize InnerProduct layers of OLD outputs to NEW (shape reports)")
    ap.add_argument("--batch", type=int, default=8, help="images per rank (M)")
    ap.add_argument("--procs", type=int, nargs="+", default=[2, 4, 8])
    ap.add_argument("--comm", default="ring", help="the allreduce algorithm (--comm)")
    ap.add_argument("--bandwidth", default="1gbit", help="link payload rate (tc words or bits/s)")
    ap.add_argument("--latency", default="0", help="one-way delay per message (50us, 2ms)")
    ap.add_argument("--overhead", default="0", help="software cost per message (e.g. 20us)")
    ap.add_argument("--links-model", metavar="JSON",
                    help="a saved LinkModel: its alpha and beta (--latency is added)")
    ap.add_argument("--gflops", type=float, help="GEMM GFLOP/s of one rank (default: measured)")
    ap.add_argument("--cores", type=int,
                    help="cores the P ranks share (compute scaled by P / cores); default: one "
                         "each")
    return ap


def hybrid_link(args):
    """The :class:`~caffe_engine.comm.hybrid_cost.Link` of ``hybrid``'s flags."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import _launch
    netlab = _launch.load_tool("netlab")
    latency = netlab.parse_time(args.latency) or 0.0
    if args.links_model:
        model = LinkModel.load(args.links_model)
        return Link(model.alpha + latency, model.beta)
    rate = netlab.parse_rate(args.bandwidth) or float("inf")
    return Link.from_rate(rate, latency, netlab.parse_time(args.overhead) or 0.0)


def print_hybrid(argv):
    """``hybrid``: the tables of :mod:`caffe_engine.perf.hybrid` (module docstring)."""
    args = hybrid_parser().parse_args(argv)
    if args.batch < 1 or min(args.procs) < 1:
        raise CaffeError("hybrid: --batch and --procs must be positive")
    layers = hybrid.load_layers(args.net, args.classes)
    if not any(s.type == "InnerProduct" for s in layers):
        raise CaffeError(f"hybrid: '{args.net}' has no InnerProduct layer")
    link = hybrid_link(args)
    flops = args.gflops * 1e9 if args.gflops else hybrid.measure_flops()
    rows = hybrid.hybrid_rows(layers, args.batch, args.procs, link, args.comm, flops, args.cores)
    print(f"{args.net}: batch {args.batch} per rank, --comm {args.comm}, link alpha "
          f"{link.alpha * 1e6:.1f} us, beta {link.beta * 1e9:.3f} ns/byte, "
          f"{flops / 1e9:.1f} GFLOP/s per rank"
          + (f", {args.cores} cores shared" if args.cores else ""))
    print()
    print(hybrid.layer_table(rows, layers))
    print()
    print(hybrid.iteration_table(rows, args.batch))
    return 0


def main(argv=None):
    """Run the command line; returns the exit status (0)."""
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["hybrid"]:
        try:
            return print_hybrid(argv[1:])
        except CaffeError as exc:
            sys.exit(f"cost_model.py hybrid: {exc}")
    args = parser().parse_args(argv)
    if args.fit:
        print_fit(args)
    if args.fit_links or args.report:
        print_links(args)
    if args.firecaffe:
        print(formula_table(args.bandwidths))
    return 0


if __name__ == "__main__":
    sys.exit(main())

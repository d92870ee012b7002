"""A seeded fuzzer of net prototxts: mutations of real nets, each built by the engine.

The corpus is the nets of ``models/`` and ``shared/realworld`` (data layers as the reference's
``substituted/`` Input versions) that the engine builds within a small memory budget. Each case
mutates one net a few times — a number token replaced by an edge value (0, -1, INT_MAX, 2**32,
1e30, nan ...), a line deleted, duplicated or swapped, a string token renamed, a byte inserted,
the text cut short — then parses and builds it (TEST phase) and, when the net is small, runs one
forward pass. The outcome of a case is one of:

- ``ok``: a valid mutant, built (and run);
- ``refused``: a :class:`caffe_engine.errors.CaffeError` whose message is one line;
- ``bug``: any other exception, or a multi-line message (what the contract forbids).

Runs in the current process under an address-space limit (set by the caller: tests/fuzz and
``python tests/fuzz/fuzz_nets.py --cases N``), so an allocation too large for the machine is a
MemoryError the engine must turn into one line, not a machine out of memory.

    python tests/fuzz/fuzz_nets.py --cases 2000 --seed 1 [--limit-gb 6]
"""
import argparse
import collections
import json
import math
import random
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SHARED = ROOT.parent / "shared"

EDGE_NUMBERS = ["0", "-1", "1", "2", "3", "7", "-2147483648", "2147483647", "2147483648",
                "4294967295", "4294967296", "1e30", "-1e30", "nan", "inf", "0.5", "-0.5",
                "99999999999999999999", "65536"]
TOKEN = re.compile(r'"[^"\n]*"|-?\d+(?:\.\d+)?(?:e[-+]?\d+)?|[A-Za-z_]\w*|[{}:]')
MEMORY_BUDGET = 64 * 2 ** 20        # bytes of blobs a seed net may take (data + diff)


def corpus_files():
    """Candidate seed prototxts: the reference's Input-substituted nets and every prototxt of
    models/ and shared/realworld whose data comes from Input layers or input fields."""
    files = sorted((SHARED / "realworld/reference/substituted").glob("*"))
    for path in sorted(list((ROOT / "models").rglob("*.prototxt"))
                       + list((SHARED / "realworld").rglob("*.prototxt"))):
        text = path.read_text(errors="replace")
        if "solver" in path.name or "Data" in text:
            continue
        files.append(path)
    return files


def build(text, forward=True):
    """Parse and build ``text`` as a TEST net; run one forward when it is small."""
    from caffe_engine.io import prototxt as pio
    from caffe_engine.io.upgrade import upgrade_net
    from caffe_engine.net import TEST, Net
    from caffe_engine.proto import caffe_pb2
    param = upgrade_net(pio.parse_text(text, caffe_pb2.NetParameter(), "fuzz.prototxt"),
                        "fuzz.prototxt")
    net = Net(param, TEST)
    if forward and net.memory_used * 8 <= MEMORY_BUDGET:
        net.forward()
    return net


def seeds():
    """(name, text) of the corpus nets the engine builds within the memory budget."""
    out, seen = [], set()
    for path in corpus_files():
        text = path.read_text(errors="replace")
        if text in seen:
            continue
        seen.add(text)
        try:
            net = build(text, forward=False)
        except Exception:
            continue
        if net.memory_used * 8 <= MEMORY_BUDGET:
            out.append((path.name, text))
    return out


def mutate(text, rng):
    """One mutation of prototxt ``text`` (see the module docstring)."""
    kind = rng.randrange(7)
    lines = text.split("\n")
    if kind == 0:                                            # a number -> an edge value
        spots = [m for m in re.finditer(r"(?<![\w.\"])-?\d+(?:\.\d+)?(?:e[-+]?\d+)?", text)]
        if spots:
            m = rng.choice(spots)
            return text[:m.start()] + rng.choice(EDGE_NUMBERS) + text[m.end():]
    if kind == 1 and len(lines) > 1:                          # delete a line
        del lines[rng.randrange(len(lines))]
        return "\n".join(lines)
    if kind == 2:                                            # duplicate a line
        i = rng.randrange(len(lines))
        lines.insert(i, lines[i])
        return "\n".join(lines)
    if kind == 3 and len(lines) > 1:                          # swap two lines
        i, j = rng.randrange(len(lines)), rng.randrange(len(lines))
        lines[i], lines[j] = lines[j], lines[i]
        return "\n".join(lines)
    if kind == 4:                                            # rename a string token
        spots = list(re.finditer(r'"[^"\n]*"', text))
        if spots:
            m = rng.choice(spots)
            new = rng.choice(['""', '"x"', '"data"', '"Convolution"', '"Pooling"', '"conv1"',
                              '"\\\\"', '"' + "a" * rng.randrange(1, 300) + '"'])
            return text[:m.start()] + new + text[m.end():]
    if kind == 5:                                            # insert a byte
        i = rng.randrange(len(text) + 1)
        return text[:i] + chr(rng.choice([0, 1, 9, 10, 34, 92, 123, 125, 58, 0xe9])) + text[i:]
    return text[:rng.randrange(len(text) + 1)]               # cut short


def run_case(text):
    """The outcome of building ``text``: ('ok' | 'refused' | 'bug', detail)."""
    from caffe_engine.errors import CaffeError
    try:
        build(text)
    except CaffeError as exc:
        message = str(exc)
        if "\n" in message or not message:
            return "bug", f"CaffeError not one line: {message[:300]!r}"
        return "refused", message
    except RecursionError as exc:
        return "bug", f"RecursionError: {exc}"
    except Exception as exc:  # noqa: BLE001 - every other exception is what the fuzzer finds
        return "bug", f"{type(exc).__name__}: {str(exc)[:300]}"
    return "ok", ""


def fuzz(cases, seed, log=None):
    """Run ``cases`` mutants from ``seed``; returns (Counter of outcomes, list of bugs)."""
    import logging
    logging.getLogger("caffe_engine").setLevel(logging.CRITICAL)
    rng = random.Random(seed)
    corpus = seeds()
    if not corpus:
        raise SystemExit("fuzz_nets: no seed net builds (is ../shared there?)")
    counts, bugs = collections.Counter(), []
    for case in range(cases):
        name, text = rng.choice(corpus)
        for _ in range(1 + rng.randrange(3)):
            text = mutate(text, rng)
        outcome, detail = run_case(text)
        counts[outcome] += 1
        if outcome == "bug":
            bugs.append({"case": case, "seed_net": name, "detail": detail, "text": text})
        if log and (case + 1) % 250 == 0:
            log(f"{case + 1} cases: {dict(counts)}")
    return counts, bugs


def limit_memory(gigabytes):
    """Cap this process's address space (so a huge allocation fails here, not the machine)."""
    import resource
    limit = int(gigabytes * 2 ** 30)
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--limit-gb", type=float, default=6.0)
    parser.add_argument("--json", help="write the counts and the bugs here")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    limit_memory(args.limit_gb)
    counts, bugs = fuzz(args.cases, args.seed, log=lambda s: print(s, file=sys.stderr))
    print(json.dumps({"cases": args.cases, "seed": args.seed, "outcomes": dict(counts)}))
    for bug in bugs[:20]:
        print(f"bug in case {bug['case']} ({bug['seed_net']}): {bug['detail']}")
    if args.json:
        Path(args.json).write_text(json.dumps({"outcomes": dict(counts), "bugs": bugs}, indent=1))
    return 1 if bugs else 0


if __name__ == "__main__":
    sys.exit(main())

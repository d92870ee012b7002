#!/usr/bin/env python3
"""dag_model: Shi et al.'s DAG model (WFBP, MG-WFBP, no overlap) against published and measured.

Usage::

    python tools/dag_model.py --firecaffe      # FireCaffe at 32, 64, 128 GPUs
    python tools/dag_model.py --four-minutes   # Jia et al. at 1024 and 2048 GPUs
    python tools/dag_model.py --netlab         # our emulated-network training runs

prints the tables of docs/scaling.md. The model is caffe_engine/perf (:mod:`caffe_engine.perf.dag`
and the settings :mod:`caffe_engine.perf.firecaffe`, :mod:`caffe_engine.perf.four_minutes`,
:mod:`caffe_engine.perf.netlab_runs`).
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from caffe_engine.perf.firecaffe import firecaffe_table  # noqa: E402
from caffe_engine.perf.four_minutes import four_minutes_table  # noqa: E402
from caffe_engine.perf.message_cost import DEFAULT_ALPHA  # noqa: E402
from caffe_engine.perf.netlab_runs import netlab_table  # noqa: E402


def parser():
    """The command line (see the module docstring)."""
    ap = argparse.ArgumentParser(description="Shi et al.'s DAG model: WFBP, MG-WFBP, no "
                                             "overlap; predicted against published/measured.")
    ap.add_argument("--firecaffe", action="store_true",
                    help="FireCaffe's setting at 32, 64, 128 GPUs against its published speedups")
    ap.add_argument("--four-minutes", action="store_true",
                    help="Jia et al.'s setting at 1024 and 2048 GPUs against its published "
                         "throughput")
    ap.add_argument("--netlab", action="store_true",
                    help="measured iterations/s on the emulated network against the DAG")
    ap.add_argument("--alpha", type=float, default=DEFAULT_ALPHA,
                    help="seconds per message for --firecaffe/--four-minutes")
    ap.add_argument("--link-gbit", type=float, nargs="+", default=[100.0],
                    help="--four-minutes: inter-node link rates, Gbit/s")
    ap.add_argument("--bytes-per-element", type=int, nargs="+", default=[2],
                    help="--four-minutes: gradient bytes per element (2: fp16, 4: fp32)")
    ap.add_argument("--bandwidths", type=float, nargs="+", default=[2.5e9, 6e9],
                    help="--firecaffe: link bandwidths, bytes/s")
    return ap


def main(argv=None):
    """Run the command line; returns the exit status (0; argparse exits 2 on a usage error)."""
    ap = parser()
    args = ap.parse_args(argv)
    if not (args.firecaffe or args.four_minutes or args.netlab):
        ap.error("give --firecaffe, --four-minutes or --netlab")
    if args.firecaffe:
        print(firecaffe_table(alpha=args.alpha, bandwidths=args.bandwidths))
        print()
    if args.four_minutes:
        print(four_minutes_table(alpha=args.alpha, link_gbit=args.link_gbit,
                                 bytes_per_element=args.bytes_per_element))
        print()
    if args.netlab:
        print(netlab_table())
    return 0


if __name__ == "__main__":
    sys.exit(main())

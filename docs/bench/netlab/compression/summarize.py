"""The tables of docs/compression.md "Speed on the emulated network", from the results.json files
of tools/scaling_check.py --compress ... --link_model ... in this folder (mlp_*).

Per setting: the measured median (as in each table.md), the prediction of its own run (compute =
that run's P = 1 median x P / cores) and the prediction with the P = 1 median pooled over every
run here (the P = 1 runs shared the machine with other jobs: their rates spread 1.9-9.0 it/s);
dense bytes per iteration (not logged) from the tree's schedule: the busiest rank sends
2 n (P = 4) or 3 n (P = 8) float32 values (n = the gradient count).

    python docs/bench/netlab/compression/summarize.py
"""
import glob
import json
import os
import statistics

HERE = os.path.dirname(os.path.abspath(__file__))
CORES = 2
N = 5824522          # models/mlp_wide's gradients (float32 values)


def main():
    files = sorted(glob.glob(os.path.join(HERE, "mlp_*", "results.json")))
    data = {os.path.basename(os.path.dirname(f)): json.load(open(f)) for f in files}
    p1 = [r["median"] for d in data.values() for r in d["runs"] if r["procs"] == 1]
    t1 = 1.0 / statistics.median(p1)
    print(f"P = 1 runs: {len(p1)}, it/s {min(p1):.2f}-{max(p1):.2f}, median "
          f"{statistics.median(p1):.3f} ({t1 * 1e3:.0f} ms/iter)\n")
    for name, d in data.items():
        link = "100 Mbit/s" if "100mbit" in name else "1 Gbit/s"
        print(f"### {name} ({link})\n")
        print("| P | method | density | it/s median (min-max) | ms/iter | bytes/iter (busiest "
              "rank) | predicted ms (own P = 1: compute + select + comm) | meas/pred | "
              "predicted ms (pooled P = 1) | meas/pred |")
        print("|---|---|---|---|---|---|---|---|---|---|")
        for r in d["rows"]:
            if r["procs"] == 1:
                continue
            sent = r.get("bytes_iter")
            if sent is None and r.get("compress") == "none":
                sent = (2 if r["procs"] == 4 else 3) * N * 4
                sent = f"{sent:.0f} (tree, computed)"
            else:
                sent = f"{sent:.0f}"
            parts = r["predicted_parts"]
            own = r["predicted_s"]
            share = max(1.0, r["procs"] / CORES)
            pooled = t1 * share + parts["select"] + parts["comm"]
            meas = 1.0 / r["median"]
            dens = "-" if r.get("density") is None else f"{r['density']:g}"
            print(f"| {r['procs']} | {r['compress']} | {dens} | {r['median']:.3f} "
                  f"({r['low']:.3f}-{r['high']:.3f}) | {meas * 1e3:.0f} | {sent} | "
                  f"{own * 1e3:.0f} ({parts['compute'] * 1e3:.0f} + {parts['select'] * 1e3:.0f}"
                  f" + {parts['comm'] * 1e3:.0f}) | {meas / own:.2f} | "
                  f"{pooled * 1e3:.0f} ({t1 * share * 1e3:.0f} + ...) | {meas / pooled:.2f} |")
        print()


if __name__ == "__main__":
    main()

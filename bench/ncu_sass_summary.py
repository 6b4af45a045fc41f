"""Where a kernel's warps wait, by SASS opcode, from Nsight Compute's source page (no GPU needed
once the report is back):

    ncu --set full --import-source yes -k regex:_gdn_ -o rep python3 bench/ncu_gated_delta.py
    ncu -i rep.ncu-rep --page source --csv --print-source sass > sass.csv
    python3 bench/ncu_sass_summary.py sass.csv

Prints, per kernel: its instruction count, the share of each stall reason over all warp samples,
and the sampled share and executed count of the 25 opcodes that take the most samples."""
import collections
import csv
import sys


def main(path):
    kernel, header, data = None, None, collections.defaultdict(list)
    for row in csv.reader(open(path)):
        if row and row[0] == "Kernel Name":
            kernel = row[1]
        elif row and row[0] == "Address":
            header = row
        elif kernel and header and len(row) > 5:
            data[kernel].append(dict(zip(header, row)))
    for kernel, rows in data.items():
        total = sum(float(r["Warp Stall Sampling (All Samples)"] or 0) for r in rows)
        print("==", kernel, len(rows), "instructions, samples", total)
        stalls = collections.Counter()
        for r in rows:
            for key, value in r.items():
                if key.startswith("stall_") and "Not Issued" not in key:
                    stalls[key] += float(value or 0)
        print({k: round(v / total, 3) for k, v in stalls.most_common(10)})
        samples, executed = collections.Counter(), collections.Counter()
        for r in rows:
            words = r["Source"].split()
            op = (words[1] if words and words[0].startswith("@") and len(words) > 1 else words[0] if words else "")
            op = op.split(".")[0]
            samples[op] += float(r["Warp Stall Sampling (All Samples)"] or 0)
            executed[op] += float(r["Instructions Executed"] or 0)
        print("samples by opcode", [(k, round(v / total, 3), int(executed[k])) for k, v in samples.most_common(25)])


if __name__ == "__main__":
    main(sys.argv[1])

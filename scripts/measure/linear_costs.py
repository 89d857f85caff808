"""Cost of one linear layer by batch rows and weight format: does verifying k tokens cost k steps here?

    .venv/bin/python scripts/measure/linear_costs.py [--threads N]

Times ``linear(1536 -> 8960)`` (the embedded target's MLP up-projection) for 1..64 rows with bf16
and fp32 weights and with the draft's weight-only int8 kernel (bf16 activations), median of 20 runs.
On a CPU with native bf16 matmuls (AVX-512-BF16 / AMX) or a GPU the bf16 row cost is nearly flat up
to tens of rows: verification is almost free.  Where it grows linearly, speculation cannot pay.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch


def median_ms(fn, reps: int = 20) -> float:
    for _ in range(3):
        fn()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1000)
    return statistics.median(times)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    ap.add_argument("--rows", default="1,2,4,8,16,32,64")
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    k, n = 1536, 8960
    w = torch.randn(n, k) * 0.02
    wb = w.bfloat16()
    scale = w.abs().amax(1) / 127
    w8 = torch.round(w / scale[:, None]).to(torch.int8)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, "
          f"oneDNN bf16: {torch.ops.mkldnn._is_mkldnn_bf16_supported()}")
    print("| rows | bf16 ms | fp32 ms | int8 weights, bf16 activations ms |\n|---|---|---|---|")
    for m in (int(r) for r in args.rows.split(",")):
        x = torch.randn(m, k)
        xb = x.bfloat16()
        bf16 = median_ms(lambda: torch.nn.functional.linear(xb, wb))
        fp32 = median_ms(lambda: torch.nn.functional.linear(x, w))
        int8 = median_ms(lambda: torch._weight_int8pack_mm(xb, w8, scale.bfloat16()))
        print(f"| {m} | {bf16:.2f} | {fp32:.2f} | {int8:.2f} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""The exact stage's CPU time on two checkouts of interp, run alternately (the machine may be shared: CPU seconds,
in pairs): ``ablate_bias(estimate="exact", n_control=0, layers=[0, 3])`` on ``scale.py``'s random-init 25m model
at 2 x 128 tokens, two batches, one thread; prints one RESULT line (wall and CPU seconds, rows, the sums of kl and
delta, which must agree between the checkouts).

    for i in 1 2 3; do for root in OLD NEW; do python benchmarks/exact_stage_time.py $root auto; done; done

-> docs/results/scale/memory_recompute_time.csv (the intact logits held, then recomputed per vocabulary tile).
"""

import sys
import time

import torch


def main(root: str, stack: str, size: str = "25m", tokens: int = 128) -> None:
    sys.path.insert(0, root)
    sys.path.insert(0, root + "/benchmarks")
    torch.set_num_threads(1)
    import interp
    import scale

    model = scale.build(size, "cpu", torch.float32)
    g = torch.Generator().manual_seed(0)
    data = [torch.randint(0, 32000, (2, tokens), generator=g) for _ in range(2)]
    options = dict(estimate="exact", n_control=0, n_boot=0, progress=False, layers=[0, 3], kinds=("q", "k", "v"))
    if stack != "auto":
        options["stack"] = int(stack)
    wall, cpu = time.perf_counter(), time.process_time()
    df = interp.ablate_bias(model, data, **options)
    print(f"RESULT {root.split('/')[-1]} stack={stack} seconds={time.perf_counter() - wall:.2f} "
          f"cpu={time.process_time() - cpu:.2f} rows={len(df)} kl_sum={df['kl'].sum():.9g} "
          f"delta_sum={df['delta'].sum():.9g}", flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:3], *sys.argv[3:4], *[int(a) for a in sys.argv[4:5]])

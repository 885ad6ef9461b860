"""PyTorch checks for tests/gpu/check.sh, run under libquanta.so with QUANTA_POD set.

Usage: torch_checks.py cap CAP_BYTES   -> the cap is what torch sees; allocating past it
                                           raises OutOfMemoryError in this process only
       torch_checks.py work SECONDS    -> matmuls for SECONDS (its launches reach the gate)
Prints one JSON object on stdout; exit 0 when the check held.
"""
import json
import sys
import time


def check_cap(cap):
    import torch

    free, total = torch.cuda.mem_get_info()
    blocks, oom = [], False
    try:
        for _ in range(100000):
            blocks.append(torch.empty(256 << 20, dtype=torch.uint8, device="cuda"))
    except torch.cuda.OutOfMemoryError:
        oom = True
    held = sum(b.numel() for b in blocks)
    del blocks
    torch.cuda.empty_cache()
    # After the denial the process is healthy: it can still allocate and compute.
    x = torch.ones(1024, 1024, device="cuda")
    healthy = float((x @ x).sum().item()) == 1024.0 ** 3
    ok = total == cap and free <= cap and oom and held <= cap and healthy
    return ok, {"mem_get_info_total": total, "mem_get_info_free": free, "cap": cap,
                "oom_raised": oom, "held_at_oom": held, "healthy_after_oom": healthy}


def run_work(seconds):
    import torch

    x = torch.randn(2048, 2048, device="cuda")
    deadline, n = time.time() + seconds, 0
    while time.time() < deadline:
        x = torch.tanh(x @ x)
        n += 1
    torch.cuda.synchronize()
    return True, {"iterations": n}


def main():
    try:
        import torch  # noqa: F401
    except ImportError:
        print(json.dumps({"ok": None, "skip": "torch is not installed"}))
        return 0
    if sys.argv[1] == "cap":
        ok, figures = check_cap(int(sys.argv[2]))
    else:
        ok, figures = run_work(float(sys.argv[2]))
    import torch
    figures["torch"] = torch.__version__
    figures["alloc_conf"] = __import__("os").environ.get("PYTORCH_CUDA_ALLOC_CONF", "")
    print(json.dumps({"ok": ok, **figures}))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

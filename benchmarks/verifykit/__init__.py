"""The pieces of ``benchmarks/verify.py``: the host it runs on, the rows it writes, the
checks (any CPU, many cores, CUDA), and the planner that runs them against a time budget.

Each check runs in a child process (``verify.py --child NAME``), so a crash, a hang or an
out-of-memory in one check costs that check's rows, not the others'.
"""

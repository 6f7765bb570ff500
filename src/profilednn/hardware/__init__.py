"""What the machine can do, below every job that asks: projection, optimize and the advice.

- ``machine``: the machine's profile (topology, ISA, measured GEMM peaks per dtype and
  thread count, memory bandwidth, the cache sweep), measured once and cached as TOML, or
  read from a hand-written file for another machine (``get_machine``, ``MachineProfile``);
  the profile type and its file are ``machine_profile``, the measuring ``measure``, and
  ``machine`` (the cache) re-exports both.
- ``dtypes``: model FLOPs per dtype, the peak each dtype is held against, MFU.
- ``roofline``: the fastest a primitive or op could run at those peaks (attainable time,
  arithmetic intensity, compute or memory bound) and the FLOP/byte model of framework ops.

The modules are imported by name (``dtypes`` and ``roofline`` pull in polars, a
measurement torch); the ``profilednn machine`` verb and ``profilednn.get_machine`` reach
them through ``projection/api.py``.
"""

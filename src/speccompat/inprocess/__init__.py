"""The in-process wing: speculators 0.3/0.4's generator after ``speccompat.apply()``.

Its catalogue (``adapters``), and what its adapters share: per-layer capture in the
workers (``capture``), the shared-memory transfer (``shm``), the checks on what crosses a
process boundary (``guards``), ``collective_rpc`` with one reply shape (``rpc``) and the
cleanup of a failed generator (``teardown``).
"""

"""``mpmd``: the tool's own package.

``mpmd.cli`` is the command line (``mpmd ...`` or ``python -m mpmd ...``); ``ir.files`` is the
one place the tool reads a user's file and writes an output (guarded reads, atomic writes). The
planner, simulator, compiler, hardware profiles and reports are the sibling packages it drives.
"""

"""FLOPs and bytes of operators from the shapes a trace holds, and the peaks they run against.

The model is data-driven, as the mapping tables are: ``maps/<framework>.csv`` names, per native
operator name, a *family* (GEMM, convolution, attention, recurrent, elementwise, normalization,
softmax, reduction, pooling, copy, optimizer …) and where that family finds its operands;
:mod:`opprof.flops.families` holds one small function per family that turns a call's shapes into
a :class:`~opprof.flops.families.Cost`; :mod:`opprof.flops.table` loads the tables and costs a
call; :mod:`opprof.flops.attribute` counts each event's cost once along the nesting of the events
table (the operator whose time counts gets what runs inside it); :mod:`opprof.flops.peaks` is the
machine's peak (a GPU table keyed by device name, a CPU calibration, a user's override).

Nothing here imports pandas: the Kineto reader costs events while it streams a file, in a process
that has only msgspec and numpy.
"""

"""The performance model: a trace's step split into the iteration model's terms, its
gradients and collectives, simulated on N workers (synchronous data parallel, parameter
servers, FSDP), its what-ifs. A room above the analyses: it reads the events table and the
analyses' results; the core and the analyses import nothing from it. The simulated step's
shared types are in :mod:`opprof.model.step`."""

"""The program format: the instruction set and program (``isa``), the .hbm file and its
listing, the modelled marches and the cost model."""

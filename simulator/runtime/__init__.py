"""The runtime: the executor that runs a program, the compiled kernels' build and loading
(``native``), replay of re-viewing instructions, the frozen plan and its packed calls."""

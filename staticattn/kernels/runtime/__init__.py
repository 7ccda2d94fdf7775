"""How a kernel runs: the backend choice, Triton launches at the cost of their compiled
launcher or frozen into one driver call, deferred definitions, the optional DeepSeek libraries."""

"""The compressed-KV device work: per kv-source type the slots and entry counts, the decode
operand derived from a top-k, and the step's entry-boundary flag."""

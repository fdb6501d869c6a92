"""Layer 2, reading TIR: blocks, accesses and their domains as plain data, and the exact IR
normalisations the rewrite needs. IR in, data (or equivalent IR) out; nothing is matched here."""

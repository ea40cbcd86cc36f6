"""ilp layer (see DESIGN.md)."""

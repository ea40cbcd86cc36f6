"""executor layer (see DESIGN.md)."""

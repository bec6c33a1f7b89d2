"""Device memory, transfers, view geometry and RNG state."""

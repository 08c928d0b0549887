"""What a serving process meets: the monitor that watches its compiles, why a variant misses, the C
launchers Triton builds at its first launch."""

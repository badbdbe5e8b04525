"""Infrastructure every layer may use: params and typed configs, stage drivers, atomic I/O,
input checks, errors, progress, devices, the artefact layout, DVC-tracked paths, the hub."""

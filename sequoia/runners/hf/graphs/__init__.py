"""CUDA graphs for the Hugging Face runtime: the graph runner over a slot cache, its captured forwards and
whole-draft programs, the captures at load or inside one GPU call, the compile cache; imports the runner seam,
the core and the HF runner only (never the engine)."""

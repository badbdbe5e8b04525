"""Search primitives: BM25 and its kernels, the FAISS index, rank fusion. No system logic."""

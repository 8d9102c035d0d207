// layer_norm family, CPU kernels (placeholder until the family lands).

// softmax family, CPU kernels (placeholder until the family lands).

"""Standard against triple-product (Gram determinant) attention: the attention kinds and their tasks."""

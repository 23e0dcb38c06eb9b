"""Standard against triple-product (Gram determinant) attention: the attention kinds and their tasks.

self_attention  the kinds' kernels, their table KINDS (one AttentionKind entry per kind) and
                CausalSelfAttention, which reads it
runs            layers whose weights carry a run dimension, and AdamW and clipping per run: R runs as one model
model           seed 004's OneLayerModel and the pre-norm ResidualModel (build_model), each of R runs
study_config    the attention study's config, evaluation lengths and learning-rate schedules
tasks           the study's tasks: offset_copy, loud_copy, mqar
steps           a training step (the host's part, the device's), on a GPU replayed from a CUDA graph
training        the study's training loop, learning-rate sweep and evaluation
copy_task       seed 004's copy task and its Gram resilience analysis
"""

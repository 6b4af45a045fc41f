"""End-to-end models assembled from the project's kernels.

`models.qwen2`: a Qwen2-style decoder (Qwen2, Bielik 1.5B); `models.loader`: Hugging Face
checkpoint directories; `models.kv_cache`: contiguous and paged KV caches; `models.generate`:
prefill + decode generation and the `kernelcheck-generate` command.

Nothing is imported here: `kernels` must be imported only after the backend is chosen
(TRITON_INTERPRET=1 for the interpreter), which the generate command does from its --device.
"""

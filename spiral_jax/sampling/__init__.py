"""Batched KV-cache sampling with one compiled prefill + decode program per bucket."""
from spiral_jax.sampling.logits import sample_token, truncate
from spiral_jax.sampling.sampler import SampleOutput, Sampler, SamplingParams, bucket_length

__all__ = ["bucket_length", "SampleOutput", "Sampler", "SamplingParams", "sample_token", "truncate"]

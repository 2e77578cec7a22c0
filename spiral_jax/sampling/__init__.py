"""Batched KV-cache sampling with one compiled prefill + decode program per bucket."""
from spiral_jax.sampling.logits import sample_token
from spiral_jax.sampling.sampler import (MIN_TEMPERATURE, SampleOutput, Sampler, SamplingParams, batch_bucket,
                                         bucket_length, cache_slots)

__all__ = ["batch_bucket", "bucket_length", "cache_slots", "MIN_TEMPERATURE", "SampleOutput", "Sampler",
           "SamplingParams", "sample_token"]

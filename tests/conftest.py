import os

from hypothesis import HealthCheck, settings

# The reference is float64 NumPy: examples are fast but their time varies with
# the drawn sizes, so no per-example deadline. ATTNSPEC_HYPOTHESIS_EXAMPLES
# raises the example count for a deeper local run.
settings.register_profile(
    "attnspec",
    deadline=None,
    max_examples=int(os.environ.get("ATTNSPEC_HYPOTHESIS_EXAMPLES", "300")),
    suppress_health_check=[HealthCheck.too_slow],
    derandomize=True,
)
settings.load_profile("attnspec")

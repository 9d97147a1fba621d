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


KILLS_KEY = "attnspec/mutant-kills"


def pytest_configure(config):
    """The controller clears the kill table; test processes (xdist workers too) add to it."""
    if not hasattr(config, "workerinput") and config.cache is not None:
        config.cache.set(KILLS_KEY, {})


def record_kill(config, name, rule, cases):
    kills = config.cache.get(KILLS_KEY, {}) or {}
    kills[name] = [rule, cases]
    config.cache.set(KILLS_KEY, kills)


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    """Print the mutant kill table when the mutant tests ran."""
    kills = config.cache.get(KILLS_KEY, {}) if config.cache is not None else {}
    if not kills:
        return
    terminalreporter.section("conformance mutants: every one must be killed")
    for name, (rule, cases) in sorted(kills.items()):
        state = f"killed by {len(cases):2d} cases" if cases else "SURVIVED"
        first = f" (e.g. {cases[0]})" if cases else ""
        terminalreporter.write_line(f"{name:30s} {rule:10s} {state}{first}")

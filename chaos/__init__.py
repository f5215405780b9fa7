"""The failure-injection harness: scenarios, fault injectors, supervisor, invariant checker."""

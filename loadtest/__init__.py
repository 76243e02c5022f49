"""Load tests: locust users and load shapes, a corpus builder, a runner that writes CSV,
a JSON summary and plots. Run locust as its own process (``python -m loadtest.run``)."""

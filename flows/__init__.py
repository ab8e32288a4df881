"""Prefect flows: preprocess, train, report and the whole pipeline."""

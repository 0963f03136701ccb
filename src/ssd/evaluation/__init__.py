"""Evaluation: detection metrics and the evaluator that scores a backend on a dataset split."""

"""Design-based estimation of areas and accuracies from reference samples."""

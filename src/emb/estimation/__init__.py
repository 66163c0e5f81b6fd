"""Crop areas in hectares and map accuracy from stratified samples (design-based estimation):
the estimators, the population a map defines, the sample design and its files, the test
split's check, the table, and the two stages (rules ``sample_design``, ``area_estimates``)."""

"""Predictors of duration, bandwidth and IPC per SM quota.

schema.py    the sample kinds (task, query, group): features, targets, version
store.py     the per-device sample store (JSONL, resumable by sample key)
synth.py     SYNTHETIC samples from simgpu's device model, until profiles exist
prep.py      feature / target scaling for the MLP, KNN and LR models
train.py     fit (80/20 split, k-fold CV), save and load models
compiled.py  trees, forests and MLPs evaluated in C (forest.c, mlp.c via cffi,
             built by build.py), numpy fallback with the same results
report.py    holdout MAPE, error percentiles, latency vs scikit-learn, figures
cli.py       `train`, `report`, `schema`, `synth` (a typer sub-app)

Heavy imports (scikit-learn, matplotlib) happen inside functions, so that
importing the CLI costs little.
"""

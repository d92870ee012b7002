"""Performance and scaling models of data-parallel training: offline, beside :mod:`..comm`.

Nothing here runs during training: ``--bucket_mb auto`` reads a fitted model file
(``CAFFE_COST_MODEL``) with :mod:`caffe_engine.comm.allreduce_cost`, the runtime half of
:mod:`.alpha_beta`. This package imports :mod:`caffe_engine.comm`, never the other way round.
This file imports nothing, so that importing one module loads only what it needs.

Communication, one allreduce:

* :mod:`.alpha_beta`: Hockney's alpha-beta model, ``alpha * A(P) + beta * n * B(P)`` (each
  registered algorithm's A(P), B(P) keyed by its :mod:`caffe_engine.comm.registry` name, in
  :mod:`caffe_engine.comm.allreduce_cost`), :class:`.alpha_beta.AlphaBetaModel` fitted per
  algorithm on ``tools/bench_allreduce.py``'s rows.
* :mod:`.schedules`: each algorithm as our code (or MPICH) runs it: stages of concurrent
  transfers over per-host links; :mod:`.link_model`: :class:`.link_model.LinkModel`, one alpha and
  one beta of the links (and of the intra-node paths) timing those schedules, fitted on the
  emulated network's rows; :mod:`.link_report`: measured against predicted.
* :mod:`.compressed`: the schedule of one bucket under ``--comm_compress``.
* :mod:`.message_cost`: one allreduce as ``alpha_eff + beta_eff * n`` for the DAG, the
  hierarchical allreduce included.
* :mod:`.fit`: the non-negative least squares both models use, and their JSON files.

Computation and the iteration:

* :mod:`.iteration`: compute plus the gradient allreduce, after backward or bucket by bucket
  during it; weak-scaling speedup.
* :mod:`.dag`: Shi et al.'s DAG of one iteration (no overlap, WFBP, MG-WFBP, fixed buckets);
  :mod:`.profiles`: the per-layer backward times and gradient sizes it needs.

The published settings the models are checked against (docs/scaling.md's tables, printed by
``tools/cost_model.py`` and ``tools/dag_model.py``): :mod:`.firecaffe`, :mod:`.four_minutes`,
:mod:`.netlab_runs`.
"""

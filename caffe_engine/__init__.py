"""caffe_engine: BVLC Caffe's nets, solvers and weights, trained on NumPy or CuPy."""

"""Tensor-parallel jobs of one checkpoint layer (not run on Ascend hardware here: HCCL on Ascend, mccl between CPU
processes here).

    msrun    ``ms-swiglu run --tp-size K``: K ranks through MindSpore's launcher msrun (no MindSpore import)
    worker   one rank: ``python -m ms_swiglu.launch.worker``, the script msrun runs on every node
"""

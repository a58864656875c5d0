"""The torch engine: model forward, KV cache, scheduler, sampler. No Django import below here.

(The parent package sets KMP_BLOCKTIME=0 before torch loads; see inference/__init__.py.)
"""

"""torchtitan 0.3.0 config for llama3-70b on 128 x h100-sxm, exported by mpmd from data/llama3-70b-h100x128.json.

Launch from the directory holding this file: PYTHONPATH=. torchrun --nnodes 16 --nproc-per-node 8 -m torchtitan.train --module llama3-70b-h100x128 --config mpmd_plan
"""

from torchtitan.config import ParallelismConfig
from torchtitan.distributed.activation_checkpoint import FullAC
from torchtitan.models.common.config_utils import decoder_vocab_size
from torchtitan.models.llama3 import config_registry, model_registry

TORCHTITAN_VERSION = '0.3.0'


def mpmd_plan():
    config = config_registry.llama3_70b()   # torchtitan's recipe: optimizer, data, checkpoints
    config.model_spec = model_registry('70B')
    for block in config.model_spec.model.layers:   # the plan's rope scaling, not the flavour's
        block.attention.rope.scaling = 'none'
    config.loss.loss_fn.global_vocab_size = decoder_vocab_size(config.model_spec)
    # the recipe's training settings (steps, dtype, ...) kept; the plan's batch and sequence
    config.training.local_batch_size = 32
    config.training.global_batch_size = 256
    config.training.seq_len = 8192
    config.training.mixed_precision_param = 'bfloat16'
    # torchtitan's trainer refuses CUDA graphs with pipeline parallel and with its all-to-all expert dispatch
    config.training.disable_cuda_graphs = True
    config.parallelism = ParallelismConfig(
        data_parallel_replicate_degree=1,
        data_parallel_shard_degree=8,
        tensor_parallel_degree=4,
        pipeline_parallel_degree=4,
        context_parallel_degree=1,
        pipeline_parallel_schedule='1F1B',
        pipeline_parallel_microbatch_size=1,
        module_fqns_per_model_part=[['tok_embeddings', 'layers.0', 'layers.1', 'layers.2', 'layers.3', 'layers.4', 'layers.5', 'layers.6', 'layers.7', 'layers.8', 'layers.9', 'layers.10', 'layers.11', 'layers.12', 'layers.13', 'layers.14', 'layers.15', 'layers.16', 'layers.17'], ['layers.18', 'layers.19', 'layers.20', 'layers.21', 'layers.22', 'layers.23', 'layers.24', 'layers.25', 'layers.26', 'layers.27', 'layers.28', 'layers.29', 'layers.30', 'layers.31', 'layers.32', 'layers.33', 'layers.34', 'layers.35', 'layers.36', 'layers.37', 'layers.38'], ['layers.39', 'layers.40', 'layers.41', 'layers.42', 'layers.43', 'layers.44', 'layers.45', 'layers.46', 'layers.47', 'layers.48', 'layers.49', 'layers.50', 'layers.51', 'layers.52', 'layers.53', 'layers.54', 'layers.55', 'layers.56', 'layers.57', 'layers.58', 'layers.59'], ['layers.60', 'layers.61', 'layers.62', 'layers.63', 'layers.64', 'layers.65', 'layers.66', 'layers.67', 'layers.68', 'layers.69', 'layers.70', 'layers.71', 'layers.72', 'layers.73', 'layers.74', 'layers.75', 'layers.76', 'layers.77', 'layers.78', 'layers.79', 'norm', 'output']],
    )
    config.activation_checkpoint = None
    return config

"""A torchtitan config registry whose configs checkpoint through Tessera.

    -m torchtitan.train --module tessera_config --config llama3_debugmodel_tessera

(with this folder on PYTHONPATH; torchtitan imports MODULE.config_registry, else MODULE, and
calls FUNCTION for its Trainer.Config). Every other setting is the torchtitan config's own,
and the command line overrides any of them (--checkpoint.interval=5, --training.steps=20).
"""

from torchtitan.models.llama3.config_registry import llama3_debugmodel

from tessera.torchtitan import use_tessera


def llama3_debugmodel_tessera():
    """torchtitan's llama3 debug model, saved every 5 steps through Tessera; the last step's
    model exported as Hugging Face safetensors."""
    return use_tessera(llama3_debugmodel(), enable=True, interval=5,
                       last_save_model_only=True, last_save_in_hf=True)

"""A PEFT adapter trained on any method reloads to the same model, whether or not it saves the
method's own parameters: what the adapter does not carry is rebuilt with the same values."""

import pytest
import torch
import transformers as T
from hub_fixtures import padded_batch, small_options, tiny_config

import hf_efficient_attn as hea

peft = pytest.importorskip("peft")

#: Options that give the methods their own learnable parameters where they have any.
WITH_PARAMETERS = {"conv_window": 3, "conv_kernel_size": 3}


@pytest.fixture(scope="module")
def plain_checkpoint(tmp_path_factory):
    folder = tmp_path_factory.mktemp("plain")
    torch.manual_seed(0)
    T.BertForSequenceClassification(tiny_config("bert", num_labels=2, initializer_range=0.5)).save_pretrained(folder)
    return folder


@pytest.mark.parametrize("save_method_parameters", [True, False], ids=["modules_to_save", "lora_only"])
@pytest.mark.parametrize("method", hea.list_methods())
def test_lora_adapter_reloads_to_the_same_model(plain_checkpoint, tmp_path, method, save_method_parameters):
    def base():
        return hea.AutoModelForSequenceClassification.from_pretrained(
            plain_checkpoint, attn_impl=method, attn_config=small_options(method, **WITH_PARAMETERS)
        )

    model = base()
    saved = ["classifier"] + (hea.modules_to_save(model) if save_method_parameters else [])
    tuned = peft.get_peft_model(model, peft.LoraConfig(r=2, target_modules=["query", "value"], modules_to_save=saved))
    optimizer = torch.optim.AdamW([p for p in tuned.parameters() if p.requires_grad], lr=1e-2)
    inputs = padded_batch(model.config, 40, 25)
    for _ in range(2):
        tuned(**inputs, labels=torch.tensor([0, 1])).loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    tuned.eval()
    with torch.no_grad():
        expected = tuned(**inputs).logits
    tuned.save_pretrained(tmp_path)
    reloaded = peft.PeftModel.from_pretrained(base(), tmp_path).eval()
    with torch.no_grad():
        torch.testing.assert_close(reloaded(**inputs).logits, expected, atol=1e-5, rtol=1e-5)


def test_method_parameters_are_the_same_however_the_model_is_built(plain_checkpoint):
    """patch_model on a built model and a load from a checkpoint that lacks them draw the same values."""
    options = {"k": 8, "sharing": "none"}
    loaded = hea.AutoModel.from_pretrained(plain_checkpoint, attn_impl="linformer", attn_config=options)
    patched = hea.patch_model(T.AutoModel.from_pretrained(plain_checkpoint), "linformer", options)
    projections = [n for n, _ in loaded.named_parameters() if ".efficient_attn." in n]
    assert len(projections) == 4  # E and F of two layers, each drawn per layer
    for name in projections:
        torch.testing.assert_close(loaded.get_parameter(name), patched.get_parameter(name), atol=0, rtol=0)
    first, second = (loaded.get_parameter(f"encoder.layer.{i}.attention.self.efficient_attn.e_proj") for i in (0, 1))
    assert not torch.equal(first, second)

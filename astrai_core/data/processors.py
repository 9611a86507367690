"""A vision-language model directory's processor (image processor, tokenizer, chat
template), with or without torchvision.

transformers builds the processors of the families that also read videos (Qwen2-VL,
Qwen2.5-VL, Qwen3-VL, SmolVLM, ...) with a video processor, and its video processors need
torchvision, which astrai does not install. Their images go through the family's PIL image
processor, which needs nothing more. Without torchvision such a directory's processor is
therefore built as its own class less the video processor (:func:`image_only`): images and
text are processed by the family's own code, as with the whole processor; videos are not
(astrai reads no video parts). With torchvision installed, ``AutoProcessor`` loads the
whole processor as usual.
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

from astrai_core.errors import DataError

# A vision-language model's image processor config (transformers 5 writes the first, with
# the whole processor's; older directories have the second).
IMAGE_PROCESSOR_FILES = ("processor_config.json", "preprocessor_config.json")
# Where a directory names its processor class, in the order AutoProcessor reads them.
_CLASS_FILES = (*IMAGE_PROCESSOR_FILES, "tokenizer_config.json")
_VIDEO = "video_processor"


def load_image_processor(directory: Path) -> Any:
    """``directory``'s processor; None for a directory without an image processor config
    (a text model). A DataError naming the directory when it cannot be built."""
    directory = Path(directory)
    if not any((directory / name).is_file() for name in IMAGE_PROCESSOR_FILES):
        return None
    from transformers import AutoProcessor
    from transformers.utils import is_torchvision_available

    try:
        family = processor_class(directory)
        if family is not None and _VIDEO in family.get_attributes() \
                and not is_torchvision_available():
            processor = image_only(family).from_pretrained(str(directory))
        else:
            processor = AutoProcessor.from_pretrained(str(directory), trust_remote_code=False)
    except (OSError, ValueError, TypeError, KeyError, ImportError, AttributeError) as err:
        raise DataError(f"cannot load the image processor in {directory}: {_reason(err)}"
                        ) from None
    return processor if hasattr(processor, "image_processor") else None


def _reason(err: Exception) -> str:
    """The error's first line; its first sentence where transformers goes on to list every
    model type it knows."""
    first = (str(err).strip().splitlines() or [type(err).__name__])[0]
    return first.split(". ")[0] + "." if len(first) > 300 else first


def processor_class(directory: Path) -> type | None:
    """The transformers processor class ``directory`` names (``processor_class`` in its
    processor, image processor or tokenizer config; else its model type's); None when it
    names none that transformers has (a model whose processor ships its own code)."""
    import transformers
    from transformers.models.auto.processing_auto import PROCESSOR_MAPPING_NAMES

    name = None
    for file in _CLASS_FILES:
        config = _json(directory / file)
        auto_map = config.get("auto_map")
        if isinstance(auto_map, dict) and auto_map.get("AutoProcessor"):
            return None  # remote code: AutoProcessor refuses it with its own message
        name = name or config.get("processor_class")
    if name is None:
        name = PROCESSOR_MAPPING_NAMES.get(_json(directory / "config.json").get("model_type"))
    return getattr(transformers, name, None) if isinstance(name, str) else None


def _json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    try:
        value = json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise ValueError(f"{path.name} is not valid JSON ({err})") from None
    return value if isinstance(value, dict) else {}


@cache
def image_only(family: type) -> type:
    """``family`` (a ``ProcessorMixin`` class taking a video processor) without its video
    processor: the same name, so that it saves as ``family`` and a saved directory loads
    as the family's own processor where torchvision is installed."""
    attributes = [name for name in family.get_attributes() if name != _VIDEO]

    def __call__(self: Any, images: Any = None, text: Any = None, videos: Any = None,
                 **kwargs: Any) -> Any:
        if videos is not None:  # the whole processor would read them: say so, not drop them
            raise ValueError(f"this {family.__name__} has no video processor: videos need "
                             "torchvision")
        return family.__call__(self, images=images, text=text, **kwargs)

    namespace: dict[str, Any] = {
        "get_attributes": classmethod(lambda cls: list(attributes)),
        "__call__": __call__,
        # pickled by its family: a class made here is found by no module attribute
        "__reduce__": lambda self: (_rebuild, (family, self.__dict__)),
        "__doc__": f"{family.__name__} without its video processor (images and text only).",
    }
    if family.__name__ == "SmolVLMProcessor":
        namespace.update(_smolvlm_methods(family))
    return type(family.__name__, (family,), namespace)


def _rebuild(family: type, state: dict[str, Any]) -> Any:
    processor = image_only(family).__new__(image_only(family))
    processor.__dict__.update(state)
    return processor


def _smolvlm_methods(family: type) -> dict[str, Any]:
    """SmolVLM's ``__init__`` and ``apply_chat_template`` without what only videos need."""
    from transformers.processing_utils import ProcessorMixin

    # The arguments by name: ``from_pretrained`` passes a saved processor's settings
    # (image_seq_len) only to arguments its class's __init__ names.
    def __init__(self: Any, image_processor: Any, tokenizer: Any, video_processor: Any = None,
                 image_seq_len: int = 169, chat_template: str | None = None,
                 **kwargs: Any) -> None:
        try:
            family.__init__(self, image_processor, tokenizer, None, image_seq_len,
                            chat_template, **kwargs)
        except ImportError:
            # num2words spells a video's frame count; SmolVLM asks for it after setting up
            # everything its images need, so images go on without it
            ProcessorMixin.__init__(self, image_processor, tokenizer,
                                    chat_template=chat_template, **kwargs)

    def apply_chat_template(self: Any, conversation: Any, chat_template: str | None = None,
                            **kwargs: Any) -> Any:
        # SmolVLM's own adds its video processor's frame count and rate to the call
        return ProcessorMixin.apply_chat_template(self, conversation, chat_template, **kwargs)

    return {"__init__": __init__, "apply_chat_template": apply_chat_template}

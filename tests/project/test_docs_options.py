"""The option tables of docs/methods/*.md are the options' dataclass fields: name, default and help
(``field(metadata={"help": ...})``), row for row; a page's methods are those the README's methods
table links to it."""

import dataclasses
import re

import paths
import pytest

from hf_efficient_attn.registry import get_method_class

REPO = paths.REPO


def _pages() -> dict[str, list[str]]:
    """docs/methods page -> the methods the README's methods table links to it."""
    pages: dict[str, list[str]] = {}
    for name, page in re.findall(r"^\| \[`(\w+)`\]\((docs/methods/\w+\.md)\) \|", (REPO / "README.md").read_text(), re.M):
        pages.setdefault(page, []).append(name)
    return pages


def options_table(options_cls: type) -> str:
    """The markdown table of an options dataclass, in declaration order."""
    rows = ["| option | default | meaning |", "|---|---|---|"]
    for f in dataclasses.fields(options_cls):
        default = f'`"{f.default}"`' if isinstance(f.default, str) else str(f.default)
        rows.append(f"| `{f.name}` | {default} | {f.metadata['help'].replace('|', chr(92) + '|')} |")
    return "\n".join(rows)


def _options_section(text: str) -> str:
    match = re.search(r"^## Options\n(.*?)(?=^## |\Z)", text, re.M | re.S)
    return match.group(1) if match else ""


def test_the_readme_links_every_page_with_options():
    assert len(_pages()) >= 8 and all((REPO / page).is_file() for page in _pages())


@pytest.mark.parametrize("page", sorted(_pages()))
def test_the_options_table_of_a_methods_page_is_its_options_dataclass(page):
    """One table per options dataclass of the page's methods (mra2 and mra2_s share one), as
    ``options_table`` writes it; no other option row in the section."""
    classes = list(dict.fromkeys(get_method_class(name).options_cls for name in _pages()[page]))
    classes = [cls for cls in classes if dataclasses.fields(cls)]
    section = _options_section((REPO / page).read_text())
    for cls in classes:
        assert options_table(cls) in section, f"{page}: expected this table for {cls.__name__}:\n{options_table(cls)}"
    rows = re.findall(r"^\| `", section, re.M)
    assert len(rows) == sum(len(dataclasses.fields(cls)) for cls in classes), page


@pytest.mark.parametrize("table", ["README.md", "docs/methods/README.md"])
def test_the_defaults_the_methods_tables_name_are_the_fields_defaults(table):
    """Each ``option=value`` in a row of a methods table (README's "main option", the methods
    overview's "main options") is that option of the row's method at its default."""
    rows = re.findall(r"^\| \[`(\w+)`\]\([^)]*\) \|(.*)$", (REPO / table).read_text(), re.M)
    named = [(name, option, value) for name, row in rows for option, value in re.findall(r"`(\w+)=([^`]+)`", row)]
    assert len({name for name, _, _ in named}) >= 8, table
    for name, option, value in named:
        fields = {f.name: f.default for f in dataclasses.fields(get_method_class(name).options_cls)}
        assert option in fields, (table, name, option)
        assert value == (f'"{fields[option]}"' if isinstance(fields[option], str) else str(fields[option])), (table, name, option)


@pytest.mark.parametrize("arguments", ["ModelArguments", "MethodArguments"])
def test_the_attn_config_help_lists_each_methods_options_from_their_fields(arguments):
    import hf_efficient_attn as hea
    from hf_efficient_attn.tasks.common import args

    (help_text,) = [f.metadata["help"] for f in dataclasses.fields(getattr(args, arguments)) if f.name == "attn_config"]
    assert "method_options" in help_text
    listed = dict(re.findall(r"(\w+): ([\w, ]+)", help_text.split("Options by method: ")[1]))
    assert listed == {name: ", ".join(hea.method_options(name)) or "none" for name in hea.list_methods()}

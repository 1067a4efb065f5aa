"""The README's two first commands: CI runs exactly the test command; the main job's script exists."""

import re

import paths

REPO = paths.REPO


def _first_bash_block_after(text: str, heading: str) -> str:
    match = re.search(re.escape(heading) + r".*?```bash\n(.*?)\n```", text, re.S)
    assert match, heading
    return match.group(1).strip()


def test_ci_runs_exactly_the_readme_test_command():
    readme = (REPO / "README.md").read_text()
    command = _first_bash_block_after(readme, "**Run the tests**")
    assert "\n" not in command
    ci_lines = [line.rstrip(" \\") for line in (REPO / ".ci" / "run").read_text().splitlines()]
    assert command in ci_lines


def test_the_main_job_command_runs_a_script_of_this_repository():
    readme = (REPO / "README.md").read_text()
    command = _first_bash_block_after(readme, "**Run the main job**")
    script = re.search(r"python (scripts/\S+\.py)", command).group(1)
    assert (REPO / script).is_file()


def test_the_methods_table_lists_every_method_with_the_cost_its_class_states():
    """The README's methods table is written by hand; the method classes hold the metadata
    (``cost``, ``paper``): they must agree, row for row."""
    import hf_efficient_attn as hea
    from hf_efficient_attn.registry import get_method_class

    readme = (REPO / "README.md").read_text()
    rows = re.findall(r"^\| \[`(\w+)`\]\([^)]*\) \| ([^|]*) \| ([^|]*) \|", readme, re.M)
    assert sorted(name for name, _, _ in rows) == hea.list_methods()
    for name, paper, cost in rows:
        cls = get_method_class(name)
        assert cost.strip() == cls.cost, name
        assert paper.startswith("same paper") or cls.paper.venue.split(",")[0].split()[0] in paper, (name, paper)


def test_the_methods_pages_table_states_each_cost_as_its_class():
    """docs/methods/README.md's table has a cost column too: each cell starts with the class's ``cost``
    (what follows names the letters)."""
    import hf_efficient_attn as hea
    from hf_efficient_attn.registry import get_method_class

    table = (REPO / "docs" / "methods" / "README.md").read_text()
    rows = [line.split(" | ") for line in table.splitlines() if line.startswith("| [`")]
    costs = {re.match(r"\| \[`(\w+)`", row[0]).group(1): row[-1].rstrip(" |") for row in rows}
    assert sorted(costs) == hea.list_methods()
    for name, cost in costs.items():
        assert cost.startswith(get_method_class(name).cost), (name, cost)

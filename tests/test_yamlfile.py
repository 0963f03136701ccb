"""The YAML reader of users' files (``ssd.yamlfile.safe_load``) and its bounds in every file that is YAML (data,
training configuration, priors): alias bombs, recursive aliases, keys given twice and Python tags are refused while
parsing, with one line naming the file; values in messages are cut before they are formatted (``limits.value_text``).
"""

import pytest

from ssd.limits import MAX_VALUE_CHARS, value_text
from ssd.yamlfile import YAMLLimitError, safe_load

ALIAS_BOMB = 'l0: &l0 ["ha", "ha", "ha", "ha", "ha", "ha", "ha", "ha", "ha"]\n' + "".join(
    f"l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * 9)}]\n" for i in range(1, 10))


def test_yaml_with_a_few_aliases_reads_as_plain_yaml():
    assert safe_load("base: &b {lr: 0.1}\nfirst: *b\nsecond: [*b, 2]") == {
        "base": {"lr": 0.1}, "first": {"lr": 0.1}, "second": [{"lr": 0.1}, 2]}


def test_alias_bomb_is_refused_while_parsing():
    # l4 expands to 66,430 values, l5 to 597,871: the count passes the bound inside l5 (line 6)
    with pytest.raises(YAMLLimitError, match=r"more than 100,000 values once its aliases are expanded \(at line 6\)"):
        safe_load(ALIAS_BOMB)


def test_more_than_a_hundred_aliases_are_refused():
    text = "a: &a 1\nb: [" + ", ".join(["*a"] * 101) + "]\n"
    with pytest.raises(YAMLLimitError, match=r"more than 100 aliases \(\*name\) at line 2"):
        safe_load(text)
    assert len(safe_load("a: &a 1\nb: [" + ", ".join(["*a"] * 100) + "]\n")["b"]) == 100


def test_recursive_alias_is_refused():
    with pytest.raises(YAMLLimitError, match="recursive alias at line 1"):
        safe_load("a: &a [1, *a]")


def test_python_tags_stay_refused():
    import yaml

    with pytest.raises(yaml.YAMLError, match="python/object"):
        safe_load("!!python/object/apply:os.system ['echo hi']")


def test_alias_bomb_in_data_yaml_is_one_data_error(tmp_path):
    from ssd.data.load import load_dataset
    from ssd.errors import DataError

    (tmp_path / "data.yaml").write_text("names: [cat]\n" + ALIAS_BOMB + "train: *l9\n")
    with pytest.raises(DataError, match=r"data\.yaml:7: YAML does not parse \(more than 100,000 values"):
        load_dataset(tmp_path / "data.yaml")


def test_alias_bomb_in_nc_is_refused_without_formatting_it(tmp_path):
    from ssd.data.load import load_dataset
    from ssd.errors import DataError

    (tmp_path / "data.yaml").write_text("names: [cat]\nl: &l [1, 2, 3, 4, 5, 6, 7, 8, 9]\nnc: [*l, *l, *l, *l, *l]\n")
    with pytest.raises(DataError, match=r"nc: \[\[1, 2, 3, 4, 5, 6, \.\.\.\], \[1, 2, 3,") as info:
        load_dataset(tmp_path / "data.yaml")
    assert len(str(info.value)) < 300


def test_alias_bomb_in_config_file_is_a_config_error(tmp_path):
    from ssd.errors import ConfigError
    from ssd.training.config import TrainConfig

    (tmp_path / "config.yaml").write_text(ALIAS_BOMB + "epochs: 3\n")
    with pytest.raises(ConfigError, match=r"config\.yaml: not valid YAML \(more than 100,000 values"):
        TrainConfig.from_yaml(tmp_path / "config.yaml")


def test_config_file_with_a_key_given_twice_is_refused_naming_both_lines(tmp_path):
    from ssd.errors import ConfigError
    from ssd.training.config import TrainConfig

    (tmp_path / "config.yaml").write_text("epochs: 3\nlr: 0.01\nepochs: 300\n")
    with pytest.raises(ConfigError, match=r"config\.yaml: not valid YAML \(key 'epochs' at line 3 is given twice "
                                          r"\(first at line 1\): only one value can be meant\)"):
        TrainConfig.from_yaml(tmp_path / "config.yaml")


def test_alias_bomb_in_priors_file_is_refused(tmp_path):
    from ssd.priors.io import load_priors

    (tmp_path / "priors.yaml").write_text(ALIAS_BOMB + "priors: *l9\n")
    with pytest.raises(ValueError, match=r"priors\.yaml: not valid YAML \(more than 100,000 values"):
        load_priors(tmp_path / "priors.yaml")


def test_error_values_are_cut_before_formatting():
    nested = [1] * 9
    for _ in range(30):
        nested = [nested] * 9  # 9^31 items: formatting it whole would never end
    assert value_text(nested) == "[[[...], [...], [...], [...], [...], [...], ...], [[...], [...], [...], [...]..."
    assert value_text("x" * 10_000) == "'" + "x" * 37 + "..." + "x" * 38 + "'"
    assert len(value_text("x" * 10_000)) <= MAX_VALUE_CHARS
    assert value_text(3) == "3"

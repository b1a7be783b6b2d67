"""The inspect page in a real browser: Debian's headless Chromium driven by Selenium (the
driver at /usr/bin/chromedriver: Selenium Manager never downloads one). The demo build's
page shows the manifest's funnel, its shard browser decodes as the tokenizer does, planted
hostile documents stay characters, and the browser logs no error and requests nothing.

Skipped only without Chromium and outside CI; with `CI` set, a missing browser fails.
`LEMUR_SCREENSHOTS=DIR` saves the screenshots docs/inspect.md shows; `LEMUR_DEMO_BUILD=DIR`
takes a demo build made before instead of building one.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml
from conftest import base_recipe
from inspect_fixtures import HOSTILE, build_chat, build_demo, plant_samples, planted_drop

from lemur.data.cli import main as lemur_data
from lemur.shards.format import open_index, open_tokens
from lemur.tokenizer import open_tokenizer

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
SECTIONS = ("funnel", "drops", "mix", "histograms", "classifiers", "dedup", "other", "kept")


def _browser_missing() -> str | None:
    for path in (CHROMIUM, CHROMEDRIVER):
        if not os.access(path, os.X_OK):
            return f"{path} not installed (Debian's chromium and chromium-driver)"
    try:
        import selenium  # noqa: F401
    except ImportError:
        return "selenium not installed"
    return None


@pytest.fixture(scope="module")
def driver() -> Iterator[Any]:
    """Headless Chromium at 1366x768, with its console and network logs."""
    missing = _browser_missing()
    if missing:
        if os.environ.get("CI"):
            pytest.fail(f"CI must run the browser tests: {missing}")
        pytest.skip(missing)
    before = os.environ.get("SE_OFFLINE")
    os.environ["SE_OFFLINE"] = "true"  # Selenium Manager: never download a browser or driver
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--window-size=1366,768", "--disable-gpu"):
        options.add_argument(arg)
    options.add_argument("--disable-dev-shm-usage")
    options.set_capability("goog:loggingPrefs", {"browser": "ALL", "performance": "ALL"})
    d = webdriver.Chrome(options=options, service=Service(CHROMEDRIVER))
    try:
        yield d
    finally:
        d.quit()
        if before is None:
            os.environ.pop("SE_OFFLINE", None)
        else:
            os.environ["SE_OFFLINE"] = before


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The demo build; `LEMUR_DEMO_BUILD=DIR` takes a copy of one made before (a rerun
    then saves the build's two minutes)."""
    out = tmp_path_factory.mktemp("demo") / "demo"
    given = os.environ.get("LEMUR_DEMO_BUILD")
    if given:
        shutil.copytree(given, out, ignore=shutil.ignore_patterns(".work", "inspect.html"))
        return out
    return build_demo(out)


@pytest.fixture(scope="module")
def demo_page(demo: Path) -> Path:
    assert lemur_data(["inspect", str(demo)]) == 0
    return demo / "inspect.html"


@pytest.fixture(scope="module")
def planted_page(demo: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    planted = plant_samples(demo, tmp_path_factory.mktemp("planted") / "demo")
    assert lemur_data(["inspect", str(planted)]) == 0
    return planted / "inspect.html"


def open_page(driver: Any, page: Path, route: str = "") -> None:
    driver.get(page.as_uri() + (f"#{route}" if route else ""))
    driver.get_log("browser")  # start each test's console log afresh
    driver.get_log("performance")


def go(driver: Any, route: str) -> None:
    driver.execute_script("location.hash = arguments[0]", route)


def screenshot(driver: Any, name: str) -> None:
    folder = os.environ.get("LEMUR_SCREENSHOTS")
    if folder:
        Path(folder).mkdir(parents=True, exist_ok=True)
        driver.save_screenshot(str(Path(folder) / f"{name}.png"))


def console_errors(driver: Any) -> list[str]:
    return [e["message"] for e in driver.get_log("browser") if e["level"] in ("SEVERE", "WARNING")]


def requested_urls(driver: Any) -> list[str]:
    urls = []
    for entry in driver.get_log("performance"):
        message = json.loads(entry["message"])["message"]
        if message["method"] == "Network.requestWillBeSent":
            urls.append(message["params"]["request"]["url"])
    return urls


def test_the_funnel_is_the_manifests(driver: Any, demo: Path, demo_page: Path) -> None:
    from selenium.webdriver.common.by import By

    open_page(driver, demo_page, "funnel")
    manifest = json.loads((demo / "manifest.json").read_text())
    counted, mixed = manifest["counts"]["sources"], manifest["mix"]["sources"]
    rows = driver.find_elements(By.CSS_SELECTOR, "#funnel tbody tr")
    assert [r.get_attribute("data-source") for r in rows] == list(counted)
    for row in rows:
        name = row.get_attribute("data-source")

        def cell(field: str, row: Any = row) -> int:
            td = row.find_element(By.CSS_SELECTOR, f"td[data-field={field}]")
            return int(td.text.replace(",", ""))

        assert cell("read") == counted[name]["read"]
        assert cell("kept") == counted[name]["kept"]
        assert cell("mixed") == mixed[name]["documents"]
        assert cell("tokens") == mixed[name]["tokens"]
        assert cell("available_tokens") == mixed[name]["available_tokens"]
    screenshot(driver, "funnel")
    assert console_errors(driver) == []


def test_clicking_a_drop_reason_lists_its_samples(driver: Any, planted_page: Path) -> None:
    from selenium.webdriver.common.by import By

    source, reason = planted_drop(planted_page.parent)
    open_page(driver, planted_page, "drops")
    bar = driver.find_element(
        By.CSS_SELECTOR, f'.bar[data-source="{source}"][data-reason="{reason}"]'
    )
    bar.click()
    items = driver.find_elements(By.CSS_SELECTOR, "#drop-samples .item")
    assert len(items) == len(HOSTILE)
    rules = [i.find_element(By.CSS_SELECTOR, ".rule").text for i in items]
    assert rules == [f"mean_word_length {14.2 + i} > 10" for i in range(len(HOSTILE))]
    texts = [i.find_element(By.CSS_SELECTOR, "pre.text").get_property("textContent") for i in items]
    assert texts == list(HOSTILE)  # every character, as written
    assert driver.execute_script("return window.__pwned") is None
    assert console_errors(driver) == []


def test_a_real_builds_drop_reason_opens_its_samples(
    driver: Any, demo: Path, demo_page: Path
) -> None:
    """With the build's own samples (the samples writer, item 1), a bar of a reason the
    manifest counts lists that reason's sampled documents."""
    entry = json.loads((demo / "manifest.json").read_text()).get("samples") or {}
    folder = demo / entry.get("dir", "samples")
    assert (folder / "drops.jsonl").is_file(), f"{folder}: the demo build wrote no drop samples"
    from selenium.webdriver.common.by import By

    first = json.loads((folder / "drops.jsonl").read_text().splitlines()[0])
    open_page(driver, demo_page, "drops")
    selector = f'.bar[data-source="{first["source"]}"][data-reason="{first["reason"]}"]'
    driver.find_element(By.CSS_SELECTOR, selector).click()
    items = driver.find_elements(By.CSS_SELECTOR, "#drop-samples .item")
    assert items and items[0].find_element(By.CSS_SELECTOR, ".rule").text == first["rule"]
    screenshot(driver, "drops")


def test_the_shard_browser_decodes_as_the_tokenizer(
    driver: Any, demo: Path, demo_page: Path
) -> None:
    from selenium.webdriver.common.by import By

    manifest = json.loads((demo / "manifest.json").read_text())
    tok = open_tokenizer(demo / manifest["tokenizer"]["file"])
    open_page(driver, demo_page, "shards/1/2")
    shard_file = driver.find_element(By.ID, "shard").get_property("selectedOptions")[0].text
    entry = next(s for s in manifest["shards"] if shard_file.startswith(s["file"] + " "))
    label = driver.find_element(By.ID, "doc").get_property("selectedOptions")[0].text
    index = int(label.split()[1].replace(",", ""))
    tokens = open_tokens(demo, entry, manifest["dtype"])
    ends = np.asarray(open_index(demo, entry), dtype=np.int64)
    ids = [int(t) for t in tokens[int(ends[index - 1]) if index else 0 : int(ends[index])]]
    shown = driver.find_element(By.ID, "doc-text")
    n_tokens = len(shown.find_elements(By.CSS_SELECTOR, ".tok"))
    assert n_tokens == min(len(ids), 1500)
    assert shown.get_property("textContent") == tok.decode(ids[:n_tokens])
    controls = shown.find_elements(By.CSS_SELECTOR, ".ctl")
    assert controls[0].get_attribute("data-label") == "BOS"
    driver.find_element(By.ID, "toggle-boundaries").click()
    assert "bounds" in driver.find_element(By.TAG_NAME, "body").get_attribute("class")
    screenshot(driver, "shards")
    assert console_errors(driver) == []


def test_hostile_documents_never_run_anywhere(driver: Any, planted_page: Path) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys

    open_page(driver, planted_page)
    assert driver.execute_script("return window.__pwned") is None
    source, reason = planted_drop(planted_page.parent)
    for route in (*SECTIONS, f"drops/{source}/{reason}", "dedup/0/0"):
        go(driver, route)
        assert driver.execute_script("return window.__pwned") is None, route
        assert not driver.find_elements(By.CSS_SELECTOR, "main img, main textarea, main a")
    go(driver, "kept")
    kept = [e.get_property("textContent") for e in driver.find_elements(By.CSS_SELECTOR, "pre")]
    assert kept == list(HOSTILE)
    go(driver, "dedup/0/0")
    side = driver.find_element(By.ID, "dedup-side").get_property("textContent")
    assert HOSTILE[0] in side and HOSTILE[3] in side
    assert driver.find_elements(By.CSS_SELECTOR, "#dedup-side .ins, #dedup-side .del")
    screenshot(driver, "duplicates")
    body = driver.find_element(By.TAG_NAME, "body")
    body.send_keys("/")
    search = driver.switch_to.active_element
    assert search.get_attribute("id") == "search"
    search.send_keys("__pwned")
    results = driver.find_elements(By.CSS_SELECTOR, "#search-results .item")
    assert len(results) > len(HOSTILE)
    search.send_keys(Keys.ESCAPE)
    body.send_keys("j")
    driver.switch_to.active_element.send_keys(Keys.ENTER)  # opens the first result
    assert driver.execute_script("return location.hash").startswith("#drops/")
    assert driver.execute_script("return window.__pwned") is None
    assert console_errors(driver) == []


def test_no_console_error_and_no_request_but_the_page(
    driver: Any, planted_page: Path, demo_page: Path
) -> None:
    driver.get_log("performance")
    driver.get(planted_page.as_uri())
    for route in (*SECTIONS, "shards/0/0", "shards/4/1", "search/the"):
        go(driver, route)
    assert console_errors(driver) == []
    urls = requested_urls(driver)
    assert urls and all(u.split("#")[0] == planted_page.as_uri() for u in urls), urls
    driver.get(demo_page.as_uri())
    for route in (*SECTIONS, "shards/0/0", "search/the"):
        go(driver, route)
        if route in ("mix", "histograms", "kept", "search/the"):
            screenshot(driver, route.split("/")[0])
    urls = requested_urls(driver)
    assert urls and all(u.split("#")[0] == demo_page.as_uri() for u in urls), urls


def test_the_demo_page_opens_from_a_copy_elsewhere(
    driver: Any, demo_page: Path, tmp_path: Path
) -> None:
    """Self-contained: the page alone, copied away from its build, shows everything."""
    from selenium.webdriver.common.by import By

    copy = tmp_path / "alone.html"
    shutil.copy(demo_page, copy)
    open_page(driver, copy, "shards/0/0")
    assert driver.find_element(By.ID, "doc-text").get_property("textContent")
    go(driver, "funnel")
    assert driver.find_elements(By.CSS_SELECTOR, "#funnel tbody tr")
    assert console_errors(driver) == []


def test_a_chat_builds_loss_mask_is_shaded(
    driver: Any, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """Exactly the tokens the loss is taken on are shaded; ChatML markers are chips."""
    from selenium.webdriver.common.by import By

    build = build_chat(tmp_path_factory.mktemp("chat"))
    assert lemur_data(["inspect", str(build)]) == 0
    manifest = json.loads((build / "manifest.json").read_text())
    open_page(driver, build / "inspect.html", "shards/0/1")
    label = driver.find_element(By.ID, "doc").get_property("selectedOptions")[0].text
    index = int(label.split()[1].replace(",", ""))
    entry = manifest["shards"][0]
    ends = np.asarray(open_index(build, entry), dtype=np.int64)
    mask = np.fromfile(build / entry["mask"], dtype=np.uint8)
    want = mask[int(ends[index - 1]) if index else 0 : int(ends[index])]
    tokens = driver.find_elements(By.CSS_SELECTOR, "#doc-text .tok")
    shaded = ["loss" in t.get_attribute("class").split() for t in tokens]
    assert shaded == [bool(m) for m in want[: len(tokens)]]
    chips = {c.get_attribute("data-label") for c in driver.find_elements(By.CSS_SELECTOR, ".ctl")}
    assert {"<|im_start|>", "<|im_end|>", "BOS", "EOS"} <= chips
    screenshot(driver, "chat")
    assert console_errors(driver) == []


def test_a_fim_documents_parts_are_coloured(
    driver: Any, tmp_path: Path, corpus_dir: Path, tokenizer_model: Path
) -> None:
    """In a FIM document, the tokens after each marker take that part's colour, and the
    markers are chips named by their role."""
    import subprocess
    import sys

    from selenium.webdriver.common.by import By

    # A given model: which documents are short enough to show uncut then does not hang on
    # the trained tokenizer (trained models once depended on pytest's temporary folder, and
    # this test failed about one run in six).
    recipe = base_recipe(tmp_path, corpus_dir / "code", [corpus_dir / "a.jsonl"])
    recipe["tokenizer"] = {"model": str(tokenizer_model)}
    recipe["fim"] = {"rate": 1.0, "spm_rate": 0.0}
    (tmp_path / "fim.yaml").write_text(yaml.safe_dump(recipe))
    cli = [sys.executable, "-m", "lemur.data.cli"]
    subprocess.run([*cli, "build", str(tmp_path / "fim.yaml")], check=True, capture_output=True)
    build = Path(recipe["output"])
    assert lemur_data(["inspect", str(build)]) == 0
    manifest = json.loads((build / "manifest.json").read_text())
    markers = manifest["fim"]["markers"]
    data_ids = json.loads(
        (build / "inspect.html").read_text().split('id="lemur-data">')[1].split("</script>")[0]
    )["browser"]["shards"]
    roles = ("prefix", "suffix", "middle")

    def shows_every_part(ids: list[int]) -> bool:
        """The page holds all three markers of a PSM document and a token after the last."""
        at = [ids.index(markers[k]) if markers[k] in ids else -1 for k in roles]
        return -1 < at[0] < at[1] < at[2] < len(ids) - 1

    si, di = next(
        (si, di)
        for si, s in enumerate(data_ids)
        for di, d in enumerate(s["docs"])
        if shows_every_part(d["ids"])
    )
    open_page(driver, build / "inspect.html", f"shards/{si}/{di}")
    labels = [
        c.get_attribute("data-label") for c in driver.find_elements(By.CSS_SELECTOR, ".marker")
    ]
    assert labels[:3] == ["<prefix>", "<suffix>", "<middle>"]  # PSM (then CodeLlama's <EOT>)
    for part in ("fim-prefix", "fim-middle", "fim-suffix"):
        assert driver.find_elements(By.CSS_SELECTOR, f"#doc-text .tok.{part}"), part
    screenshot(driver, "fim")
    assert console_errors(driver) == []

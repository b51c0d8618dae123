/* The new-comparison form: build the JSON body, POST it to /v1/comparisons, follow it.
 *
 * Errors come back as problem+json with the offending `field`; each is shown under its
 * input. The API token travels in the HttpOnly login cookie (see api.js). */
(function () {
  "use strict";

  const form = document.getElementById("new-comparison");
  if (!form) return;
  const submit = document.getElementById("submit");
  const formError = document.getElementById("form-error");

  /* "blocks.*, 0, norm" -> ["blocks.*", 0, "norm"]; one item -> the item; blank -> null. */
  function parseLayers(text) {
    const items = text.split(",").map(function (s) { return s.trim(); }).filter(Boolean).map(function (s) {
      return /^-?\d+$/.test(s) ? parseInt(s, 10) : s;
    });
    if (!items.length) return null;
    return items.length === 1 ? items[0] : items;
  }

  function body() {
    const data = new FormData(form);
    return {
      model_ids: data.getAll("model_ids").map(function (v) { return parseInt(v, 10); }),
      dataset_id: parseInt(String(data.get("dataset_id")), 10),
      layers: parseLayers(String(data.get("layers") || "")),
      kernel: String(data.get("kernel")),
      estimator: String(data.get("estimator")),
      mode: String(data.get("mode")),
      batch_size: parseInt(String(data.get("batch_size")), 10),
      feature: String(data.get("feature")),
      interval: String(data.get("interval")),
      resamples: data.get("resamples") ? parseInt(String(data.get("resamples")), 10) : undefined,
      dtype: String(data.get("dtype")),
      seed: data.get("seed") ? parseInt(String(data.get("seed")), 10) : undefined,
      permutations: parseInt(String(data.get("permutations") || "0"), 10) || 0,
      null: String(data.get("null")),
      sensitivity: data.get("sensitivity") !== null,
      baselines: data.getAll("baselines").map(String),
      // blank: left out, so the server's default applies
      random_init_draws: data.get("random_init_draws") ? parseInt(String(data.get("random_init_draws")), 10) : undefined,
      force: data.get("force") !== null,
    };
  }

  function clearErrors() {
    form.querySelectorAll(".field-error").forEach(function (e) { e.textContent = ""; });
    form.querySelectorAll(".invalid").forEach(function (e) { e.classList.remove("invalid"); });
    formError.textContent = "";
  }

  function fieldError(field, message) {
    const name = String(field || "").split(".")[0];
    const slot = form.querySelector('.field-error[data-for="' + name + '"]');
    if (!slot) return false;
    slot.textContent = message;
    const wrapper = document.getElementById("field-" + name);
    if (wrapper) wrapper.classList.add("invalid");
    return true;
  }

  form.addEventListener("submit", async function (event) {
    event.preventDefault();
    clearErrors();
    const payload = body();
    if (!payload.model_ids.length) {
      fieldError("model_ids", "Choose at least one model.");
      return;
    }
    submit.disabled = true;
    submit.textContent = "Starting…";
    try {
      const res = await window.cka.api("POST", "/v1/comparisons", payload);
      window.location.assign("/comparisons/" + res.data.id);
      return;
    } catch (e) {
      const p = e.problem || {};
      if (e.status === 401) {
        formError.textContent = "Sign in with an API token to start comparisons.";
      } else {
        const errors = p.errors && p.errors.length ? p.errors : [{ field: p.field, message: p.detail }];
        let placed = false;
        errors.forEach(function (err) { placed = fieldError(err.field, err.message || p.detail) || placed; });
        formError.textContent = placed ? "Please fix the fields marked above." : (p.detail || e.message);
      }
    }
    submit.disabled = false;
    submit.textContent = "Start comparison";
  });
})();

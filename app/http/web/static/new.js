/* The new-comparison form: build the JSON body, POST it to /v1/comparisons, follow it.
 *
 * No option is named here: new.html marks each option's control with its name and kind
 * (data-option, data-kind, drawn from analysis.CompareOptions), and the body takes every one.
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

  /* One option's value as the API takes it, read by the kind new.html drew its control for:
   * a list of the ticked choices, a boolean, a number, the parsed layers, or the text.
   * A blank number or text is left out (undefined), so the option keeps its default. */
  const readers = {
    choices: function (field, name) {
      return Array.from(field.querySelectorAll('input[name="' + name + '"]:checked')).map(function (i) { return i.value; });
    },
    flag: function (field, name) { return control(field, name).checked; },
    int: function (field, name) {
      const input = control(field, name);
      if (input.validity.badInput) throw { field: name, message: name + " is a whole number." };
      return input.value.trim() === "" ? undefined : Number(input.value);
    },
    layers: function (field, name) { return parseLayers(control(field, name).value); },
    choice: function (field, name) { return control(field, name).value; },
    text: function (field, name) { return control(field, name).value.trim() || undefined; },
  };

  function control(field, name) {
    return field.querySelector('[name="' + name + '"]');
  }

  /* The request body: the models and dataset, then every option the form draws. */
  function body() {
    const data = new FormData(form);
    const payload = {
      model_ids: data.getAll("model_ids").map(function (v) { return parseInt(String(v), 10); }),
      dataset_id: parseInt(String(data.get("dataset_id")), 10),
      force: data.get("force") !== null,
    };
    form.querySelectorAll("[data-option]").forEach(function (field) {
      const name = field.dataset.option;
      const read = readers[field.dataset.kind] || readers.text;
      payload[name] = read(field, name);
    });
    return payload;
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
    let payload;
    try {
      payload = body();
    } catch (wrong) {
      fieldError(wrong.field, wrong.message);
      formError.textContent = "Please fix the fields marked above.";
      return;
    }
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

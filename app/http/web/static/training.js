/* The new-training form: the chosen preset's option fields, POST /v1/trainings, follow it.
 *
 * Filled option fields become the `config` object (each value read as JSON, else kept as
 * text); a refused option comes back as problem+json with field `config.KEY` and is shown
 * under that field. Once queued, the page polls GET /v1/trainings/{id} and links the model. */
(function () {
  "use strict";
  const STATES = window.cka.states;

  const form = document.getElementById("new-training");
  if (!form) return;
  const submit = document.getElementById("start-training");
  const formError = document.getElementById("form-error");
  const status = document.getElementById("training-status");
  const arch = form.querySelector('select[name="arch"]');

  function current() {
    return form.querySelector('fieldset.options[data-arch="' + arch.value + '"]');
  }

  function showOptions() {
    form.querySelectorAll("fieldset.options").forEach(function (f) {
      f.hidden = f.getAttribute("data-arch") !== arch.value;
    });
  }
  arch.addEventListener("change", showOptions);
  showOptions();

  function parse(text) {
    try { return JSON.parse(text); } catch (e) { return text; }
  }

  function body() {
    const data = new FormData(form);
    const config = {};
    const fieldset = current();
    if (fieldset) {
      fieldset.querySelectorAll("input[data-key]").forEach(function (input) {
        const text = input.value.trim();
        if (text) config[input.getAttribute("data-key")] = parse(text);
      });
    }
    return {
      arch: arch.value,
      dataset_id: parseInt(String(data.get("dataset_id")), 10),
      epochs: parseInt(String(data.get("epochs") || "5"), 10),
      seed: parseInt(String(data.get("seed") || "0"), 10),
      config: config,
    };
  }

  function clearErrors() {
    form.querySelectorAll(".field-error").forEach(function (e) { e.textContent = ""; });
    form.querySelectorAll(".invalid").forEach(function (e) { e.classList.remove("invalid"); });
    formError.textContent = "";
  }

  function fieldError(field, message) {
    const scope = String(field || "").indexOf("config.") === 0 ? current() : form;
    const slot = scope && scope.querySelector('.field-error[data-for="' + field + '"]');
    if (!slot) return false;
    slot.textContent = message;
    slot.parentElement.classList.add("invalid");
    return true;
  }

  async function follow(id) {
    const view = (await window.cka.api("GET", "/v1/trainings/" + id)).data;
    if (view.status === STATES.SUCCEEDED && view.model_id) {
      status.innerHTML = "";
      const link = document.createElement("a");
      link.href = "/models/" + view.model_id;
      link.id = "trained-model";
      link.textContent = "Training " + id + " succeeded: model " + view.model_id;
      status.appendChild(link);
      return;
    }
    status.textContent = "Training " + id + ": " + view.status +
      (view.error ? " — " + view.error : "");
    if (STATES.LIVE.includes(view.status)) {
      window.setTimeout(function () { follow(id); }, 1000);
    }
  }

  form.addEventListener("submit", async function (event) {
    event.preventDefault();
    clearErrors();
    submit.disabled = true;
    try {
      const res = await window.cka.api("POST", "/v1/trainings", body());
      status.textContent = "Training " + res.data.id + " queued";
      follow(res.data.id);
    } catch (e) {
      const p = e.problem || {};
      if (e.status === 401) formError.textContent = "Sign in with an API token to train.";
      else if (!fieldError(p.field, p.detail || e.message)) formError.textContent = p.detail || e.message;
    }
    submit.disabled = false;
  });
})();

# serve's /metrics (OpenMetrics text) -> one line:
#   t fallbacks backend_errors breaker_open breaker_opened store_errors allowed denied debts charges_paid
# (t is passed with -v t=NS); nothing when the text holds no store metrics (a failed scrape).
$1 == "tollgate_store_fallbacks_total" { fallbacks = $2; seen = 1 }
$1 == "tollgate_store_backend_errors_total" { backend = $2 }
$1 == "tollgate_store_breaker_open" { open = $2 }
$1 == "tollgate_store_breaker_opened_total" { opened = $2 }
$1 == "tollgate_store_debts" { debts = $2 }
$1 == "tollgate_store_charges_paid_total" { paid = $2 }
/^tollgate_store_errors_total\{/ { errors += $2 }
/^tollgate_decisions_total\{/ { if ($1 ~ /outcome="allowed"/) allowed += $2; else denied += $2 }
END {
  if (seen) printf "%s %d %d %d %d %d %d %d %d %d\n", t, fallbacks, backend, open, opened, errors, allowed, denied, debts, paid
}

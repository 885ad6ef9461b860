/* First of two libraries defining the same symbol, for the RTLD_NEXT checks. */
int shim_probe_value(void) {
  return 1;
}

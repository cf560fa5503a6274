/**
 * OpenSSH public key lines for tests (made once with ssh-keygen; their private halves were not kept):
 * what a pool's authorized-keys holds.
 */
export const ED25519_KEY =
  'ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAICFUyUvLa/q3iPVvM+Ctoc9UV4cyek3ExXK9Dt5HiDHv ci@example';
export const RSA_KEY =
  'ssh-rsa AAAAB3NzaC1yc2EAAAADAQABAAABAQC79fRDjT2LeA4XmYNvAvh7FHKL8c6qimeb0oMBoOuScXTzFJm/N1QwRBBwnK4q0lJof7HQVF7h6cbTq1zYPqkh/lAxF0wEdCP9kxgv+OkVqxUW738Fb/P46osAN0Va3NzpfP7qveUMlsjwvLDGvKbHjD3l2XOS9eg1ucsVaW7Ua/iCjYzh3fI7DxYBldFEIsIdkcfbC7OHp7iNIHyJ7D0TVXULqT4gY/ShsQ7Ei9Wtm8AXffMEGwoAfbhhCm6B6jc2g044R+Uz8YQY0l+N/Co0YxcnuPtRkz+Iipq0C6it+R2864tLQJTQWPgSyg3WWqAr8q0Nlv3e0REiBKLA5UGR rsa ci';
export const ECDSA_KEY =
  'ecdsa-sha2-nistp256 AAAAE2VjZHNhLXNoYTItbmlzdHAyNTYAAAAIbmlzdHAyNTYAAABBBD74al4e6Fv38k0dOQc4kNTKUAtNqcKCOD1S096oTUyGq+swGDXGonxma3ssdGNXppxCkazw+kW1GNP0x8seDDo=';
